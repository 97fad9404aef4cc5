from django.urls import path

from shop.orders import views

urlpatterns = [
    path("orders", views.place_order),
    path("confirmations/<str:result_id>", views.confirmation),
]
