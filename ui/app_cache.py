"""st.cache_data wrappers around ui.service, and the progress bar a search shows while it runs.

Results are cached globally (every session), keyed on the plain arguments: the same sidebar
settings give the same search result without re-running it. A cache miss that takes more
than a moment shows a spinner plus a progress bar fed by the search's progress callback.
"""

from __future__ import annotations

import contextlib

import streamlit as st

from ui import service

# Cache sizes: each search result is a few hundred kB at most; keep the last few dozen.
_MAX_ENTRIES = 64


@st.cache_data(show_spinner=False, max_entries=_MAX_ENTRIES)
def _search(request: dict, _progress) -> service.SearchResult:
    return service.search(request, _progress)


@contextlib.contextmanager
def _outside_cache_replay():
    """Let a cached function update an element created outside it.

    st.cache_data records the elements a cached function draws, to replay them on a hit; a
    progress bar belongs to this run only and must not be replayed (replaying it raises
    CacheReplayClosureError), so its updates run with recording switched off. Without the
    private hook (another streamlit version) the bar simply does not move; the spinner stays.
    """
    try:
        from streamlit.runtime.caching.cached_message_replay import in_cached_function
    except ImportError:  # pragma: no cover - depends on the streamlit version
        yield False
        return
    token = in_cached_function.set(False)
    try:
        yield True
    finally:
        in_cached_function.reset(token)


def search(request: dict) -> service.SearchResult:
    """The (cached) search for ``request``, with a spinner and a progress bar on a miss."""
    holder = st.empty()

    def progress(fraction: float, label: str) -> None:
        with _outside_cache_replay() as ok:
            if ok:
                holder.progress(min(max(fraction, 0.0), 1.0), text=f"searching deployments: {label}")

    with st.spinner("searching deployments..."):
        try:
            return _search(request, progress)
        finally:
            holder.empty()


@st.cache_data(show_spinner="estimating the step...", max_entries=_MAX_ENTRIES)
def step_breakdown(model: str, hardware: str, layout: dict, scheduler: dict, batch: int, context: int,
                   effects: dict | None = None) -> dict:
    """Cached ui.service.step_breakdown."""
    return service.step_breakdown(model, hardware, layout, scheduler, batch, context, effects)


@st.cache_data(show_spinner="simulating the plan and the what-if at full scale...", max_entries=_MAX_ENTRIES)
def what_if(plan: dict, changes: dict, num_requests: int) -> dict:
    """Cached ui.service.what_if."""
    return service.what_if(plan, changes, num_requests)


@st.cache_data(show_spinner=False)
def default_token_prices() -> dict:
    """Cached ui.service.default_token_prices."""
    return service.default_token_prices()


@st.cache_data(show_spinner=False, max_entries=_MAX_ENTRIES)
def model_info(model: str) -> dict:
    """Cached ui.service.model_info."""
    return service.model_info(model)


@st.cache_data(show_spinner=False, max_entries=_MAX_ENTRIES)
def hardware_info(hardware: str) -> dict:
    """Cached ui.service.hardware_info."""
    return service.hardware_info(hardware)
