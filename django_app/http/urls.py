"""Mount with ``path("scheduler/api/", include("django_app.http.urls"))``.

``schema/`` serves the OpenAPI 3 document generated from these views by drf-spectacular.
"""

from __future__ import annotations

from django.urls import path

from django_app.http import views

app_name = "scheduler_api"

urlpatterns = [
    path("schedules/", views.ScheduleListView.as_view(), name="schedules"),
    path("schedules/bulk/", views.BulkCreateView.as_view(), name="bulk-create"),
    path("schedules/sync/", views.SyncView.as_view(), name="sync"),
    path("schedules/bulk/<str:action>/", views.BulkView.as_view(), name="bulk"),
    path("schedules/<uuid:schedule_id>/", views.ScheduleDetailView.as_view(), name="schedule"),
    path("schedules/<uuid:schedule_id>/pause/", views.PauseView.as_view(), name="pause"),
    path("schedules/<uuid:schedule_id>/resume/", views.ResumeView.as_view(), name="resume"),
    path("schedules/<uuid:schedule_id>/cancel/", views.CancelView.as_view(), name="cancel"),
    path("schedules/<uuid:schedule_id>/run-now/", views.RunNowView.as_view(), name="run-now"),
    path("schedules/<uuid:schedule_id>/skip/", views.SkipView.as_view(), name="skip"),
    path("schedules/<uuid:schedule_id>/backfill/", views.BackfillView.as_view(), name="backfill"),
    path(
        "schedules/<uuid:schedule_id>/occurrences/",
        views.OccurrenceListView.as_view(),
        name="occurrences",
    ),
    path("occurrences/<uuid:occurrence_id>/replay/", views.ReplayView.as_view(), name="replay"),
    path("tenants/", views.TenantListView.as_view(), name="tenants"),
    path("tenants/<str:slug>/", views.TenantDetailView.as_view(), name="tenant"),
    path(
        "schema/",
        views.SchemaView.as_view(),
        name="schema",
    ),
]
