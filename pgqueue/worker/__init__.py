"""The worker: an asyncio process that leases, runs and completes jobs.

Producer (lease up to free capacity) -> executor (async tasks on the loop,
sync tasks in threads) -> completer (batched ack/fail); beside them the
listener (LISTEN/NOTIFY), heartbeat (lease extension, registration, cancel
checks) and maintenance (reaper, scheduler) loops.
"""
