"""Task applications that the worker tests serve with real ``pgqueue worker`` processes."""
