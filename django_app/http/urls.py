"""Mount with ``path("scheduler/api/", include("django_app.http.urls"))``.

``schema/`` serves the OpenAPI 3 document generated from these views by drf-spectacular.
"""

from __future__ import annotations

import uuid

from django.urls import path, re_path, register_converter

from django_app.http import views


class AnyCaseUUID:
    """A UUID in any letter case (Django's ``uuid`` converter takes lowercase only, and an
    uppercase id then met Django's HTML 404 instead of the API's JSON one)."""

    regex = "[0-9a-fA-F]{8}-[0-9a-fA-F]{4}-[0-9a-fA-F]{4}-[0-9a-fA-F]{4}-[0-9a-fA-F]{12}"

    def to_python(self, value: str) -> uuid.UUID:
        return uuid.UUID(value)

    def to_url(self, value: uuid.UUID | str) -> str:
        return str(value)


register_converter(AnyCaseUUID, "anyuuid")

app_name = "scheduler_api"

urlpatterns = [
    path("schedules/", views.ScheduleListView.as_view(), name="schedules"),
    path("schedules/bulk/", views.BulkCreateView.as_view(), name="bulk-create"),
    path("schedules/sync/", views.SyncView.as_view(), name="sync"),
    path("schedules/bulk/<str:action>/", views.BulkView.as_view(), name="bulk"),
    path("schedules/<anyuuid:schedule_id>/", views.ScheduleDetailView.as_view(), name="schedule"),
    path("schedules/<anyuuid:schedule_id>/pause/", views.PauseView.as_view(), name="pause"),
    path("schedules/<anyuuid:schedule_id>/resume/", views.ResumeView.as_view(), name="resume"),
    path("schedules/<anyuuid:schedule_id>/cancel/", views.CancelView.as_view(), name="cancel"),
    path("schedules/<anyuuid:schedule_id>/run-now/", views.RunNowView.as_view(), name="run-now"),
    path("schedules/<anyuuid:schedule_id>/skip/", views.SkipView.as_view(), name="skip"),
    path(
        "schedules/<anyuuid:schedule_id>/backfill/", views.BackfillView.as_view(), name="backfill"
    ),
    path(
        "schedules/<anyuuid:schedule_id>/occurrences/",
        views.OccurrenceListView.as_view(),
        name="occurrences",
    ),
    path("occurrences/<anyuuid:occurrence_id>/replay/", views.ReplayView.as_view(), name="replay"),
    path("tenants/", views.TenantListView.as_view(), name="tenants"),
    path("tenants/<str:slug>/", views.TenantDetailView.as_view(), name="tenant"),
    path(
        "schema/",
        views.SchemaView.as_view(),
        name="schema",
    ),
    # Last: any other path under the API (a malformed id, a typo) is the JSON 404.
    re_path(r"^.*$", views.NotFoundView.as_view(), name="not-found"),
]
