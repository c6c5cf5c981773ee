"""The HTTP JSON API: the management API of ``celery_scheduler.api`` over HTTP.

Mount it with one line in the project's urls::

    path("scheduler/api/", include("django_app.http.urls"))

Built on Django REST framework (``pip install celery-scheduler[api]``); the views set their
own authentication, permissions, renderers and error handler, so the project's
``REST_FRAMEWORK`` settings neither need changing nor change this API. Modules:
``tokens`` (hashed per-tenant tokens), ``auth`` (who is asking and which tenant they see),
``errors`` (one JSON error shape and status per failure), ``serializers`` (request and
response shapes, which drf-spectacular turns into the OpenAPI schema), ``views``, ``urls``.
Every operation calls ``celery_scheduler.api``: the HTTP layer parses, scopes and formats;
it decides nothing about schedules itself.
"""
