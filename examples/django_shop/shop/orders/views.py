from django.db import connection, transaction
from django.http import HttpRequest, JsonResponse
from django.views.decorators.csrf import csrf_exempt
from django.views.decorators.http import require_GET, require_POST

from pgqueue.contrib.django import app
from shop.orders.models import Order
from shop.orders.tasks import send_confirmation


@csrf_exempt
@require_POST
def place_order(request: HttpRequest) -> JsonResponse:
    """Create an order, its shipping job and its confirmation task in one
    transaction (``?fail=1`` fails after all were written: none is kept)."""
    try:
        with transaction.atomic():
            order = Order.objects.create(item=request.GET.get("item", "book"))
            job = app.enqueue("ship_order", {"order_id": order.pk}, conn=connection)
            order.job_id = job.job_id
            order.save(update_fields=["job_id"])
            # django.tasks: PgQueueBackend joins this same transaction by itself.
            confirmation = send_confirmation.enqueue(order.pk)
            if request.GET.get("fail"):
                raise RuntimeError("payment declined")
    except RuntimeError as exc:
        return JsonResponse({"error": str(exc)}, status=402)
    return JsonResponse(
        {"order": order.pk, "job_id": job.job_id, "confirmation": confirmation.id}, status=201
    )


@require_GET
def confirmation(request: HttpRequest, result_id: str) -> JsonResponse:
    """The Django task's result, read through the framework."""
    result = send_confirmation.get_result(result_id)
    body = {"status": str(result.status), "attempts": result.attempts}
    if result.is_finished and not result.errors:
        body["value"] = result.return_value
    return JsonResponse(body)
