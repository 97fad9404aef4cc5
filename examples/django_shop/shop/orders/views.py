from django.db import connection, transaction
from django.http import HttpRequest, JsonResponse
from django.views.decorators.csrf import csrf_exempt
from django.views.decorators.http import require_POST

from pgqueue.contrib.django import app
from shop.orders.models import Order


@csrf_exempt
@require_POST
def place_order(request: HttpRequest) -> JsonResponse:
    """Create an order and its shipping job in one transaction
    (``?fail=1`` fails after both were written: neither is kept)."""
    try:
        with transaction.atomic():
            order = Order.objects.create(item=request.GET.get("item", "book"))
            job = app.enqueue("ship_order", {"order_id": order.pk}, conn=connection)
            order.job_id = job.job_id
            order.save(update_fields=["job_id"])
            if request.GET.get("fail"):
                raise RuntimeError("payment declined")
    except RuntimeError as exc:
        return JsonResponse({"error": str(exc)}, status=402)
    return JsonResponse({"order": order.pk, "job_id": job.job_id}, status=201)
