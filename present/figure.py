"""`Figure`: a plotly figure as plain JSON data, the one type every figure builder of the views returns."""
from __future__ import annotations

import json
from typing import Any

from .style import MIN_FONT, REJECTED_TEXT


class Figure(dict):
    """A plotly figure as plain JSON data: {"data": [trace dicts], "layout": {...}}.

    Building plotly.graph_objects figures validates every property in Python (tens of ms per figure, holding
    the GIL the engine thread needs); these dicts cost well under a millisecond. gr.Plot accepts any object
    with `to_json()`; `to_plotly()` gives a real plotly Figure when wanted.
    """

    @classmethod
    def empty(cls, height: int) -> "Figure":
        """A blank white figure of a given height, axes hidden."""
        return cls(data=[], layout=dict(
            height=height, margin=dict(l=10, r=10, t=44, b=10), paper_bgcolor="white", plot_bgcolor="white",
            font=dict(size=MIN_FONT, color="#1f2937"), hoverlabel=dict(font=dict(size=MIN_FONT)), uirevision="keep",
            legend=dict(orientation="h", yanchor="top", y=0.0, x=0.0, font=dict(size=MIN_FONT)),
            xaxis=dict(visible=False), yaxis=dict(visible=False)))

    @property
    def traces(self) -> list[dict]:
        """The traces (plotly `data`)."""
        return self["data"]

    @property
    def layout(self) -> dict:
        """The plotly `layout`."""
        return self["layout"]

    def add(self, **trace: Any) -> "Figure":
        """Append a trace given as plotly attributes (type=..., x=..., ...)."""
        self["data"].append(trace)
        return self

    def title(self, text: str) -> "Figure":
        """Set the title."""
        self["layout"]["title"] = dict(text=text, x=0.01, font=dict(size=18))
        return self

    def note(self, text: str) -> "Figure":
        """Show a grey placeholder message in the middle."""
        self["layout"]["annotations"] = [dict(text=text, showarrow=False, x=0.5, y=0.5, xref="paper", yref="paper",
                                              font=dict(size=16, color=REJECTED_TEXT))]
        return self

    def to_json(self) -> str:
        """Compact JSON, as gr.Plot sends it to plotly.js."""
        return json.dumps(self, separators=(",", ":"))

    def to_plotly(self):
        """The same figure as a plotly.graph_objects.Figure (validated; slow, for notebooks and tests)."""
        import plotly.graph_objects as go

        return go.Figure(self)
