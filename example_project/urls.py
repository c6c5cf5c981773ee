"""URLs of the example project: the admin, the HTTP API, and static files.

With DEBUG off (the default) ``runserver`` serves no static files, so the admin would lose its
styles and scripts. The example serves them itself through ``staticfiles``' finder view so
``manage.py runserver`` works as is; a real deployment runs ``collectstatic`` and lets the
web server (or WhiteNoise) serve ``STATIC_ROOT`` instead of this route.
"""

from __future__ import annotations

from django.contrib import admin
from django.contrib.staticfiles.views import serve
from django.urls import include, path, re_path

urlpatterns = [
    path("admin/", admin.site.urls),
    # The HTTP JSON API (docs/howto/http-api.md): one include, with its OpenAPI schema.
    path("scheduler/api/", include("django_app.http.urls")),
    re_path(r"^static/(?P<path>.*)$", serve, {"insecure": True}),
]
