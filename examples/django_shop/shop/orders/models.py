from django.db import models


class Order(models.Model):
    item = models.CharField(max_length=100)
    job_id = models.BigIntegerField(null=True)
    shipped = models.BooleanField(default=False)
