"""Triton's restricted APIs over HTTP: the group of every route, and the header check.

The groups, the flag and the comparison are ``conch.core.restricted_apis``'; this is
the HTTP half. Every Flask view declares its group with ``@api_group``, and
``check_route`` runs ahead of every Flask request, as Triton checks the restriction
before anything else about a request (its method included). A request to a restricted
group without the group's header and value gets Triton's 403 and message. Infer calls
are answered before Flask, on every server that carries them, by
``fast_path.serve_infer``, which calls ``refuse`` itself. The metrics port is no API
group, in Triton or here: nothing on it is checked.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any, TypeVar

from flask import current_app, request
from werkzeug.exceptions import HTTPException, MethodNotAllowed

from conch.core.errors import Forbidden
from conch.core.restricted_apis import ApiGroup, RestrictedApis

_ATTR = "conch_api_group"
# A view whose group depends on what it serves (a job: its kind); it calls ``refuse``.
BY_JOB_KIND = "by job kind"

View = TypeVar("View", bound=Callable[..., Any])


def api_group(group: ApiGroup | str) -> Callable[[View], View]:
    """Declare the group of the view below: ``check_route`` reads it."""

    def mark(view: View) -> View:
        setattr(view, _ATTR, group)
        return view

    return mark


def group_of(view: Callable[..., Any]) -> ApiGroup | str | None:
    return getattr(view, _ATTR, None)


def refuse(rules: RestrictedApis, group: ApiGroup, header: Callable[[str], str | None]) -> None:
    """Raise Triton's 403 unless ``group`` is open or the request (``header`` looks a
    request header up by name) carries its header with its value."""
    rule = rules.get(group)
    if rule is not None and not rule.allows(header(rule.header)):
        raise Forbidden(f"This API is restricted, expecting header '{rule.header}'")


def checker(rules: RestrictedApis) -> Callable[[], None]:
    """The app's before-request hook for ``rules`` (none is needed when nothing is
    restricted)."""

    def check_route() -> None:
        view = current_app.view_functions.get(_endpoint() or "")
        group = None if view is None else group_of(view)
        if isinstance(group, ApiGroup):
            refuse(rules, group, request.headers.get)

    return check_route


def _endpoint() -> str | None:
    """The route's endpoint, also for a method it does not take (Triton answers a
    restricted API's 403 before its 405)."""
    if request.url_rule is not None:
        return request.endpoint
    exc = request.routing_exception
    if not isinstance(exc, MethodNotAllowed) or not exc.valid_methods:
        return None
    adapter = current_app.url_map.bind_to_environ(request.environ)
    try:
        rule, _ = adapter.match(method=next(iter(exc.valid_methods)), return_rule=True)
    except HTTPException:
        return None
    return rule.endpoint
