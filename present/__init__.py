"""The views of a decode: what the studio and the offline replay show of the engine's events.

- tree.py: the draft tree figure (its layout: tree_layout.py; what each node is: nodes.py); heatmap.py: the
  adjacency-matrix window; chart.py: tokens gained per step; figure.py: the plotly figure as plain data;
  style.py: colours, fonts and tokens made visible; meter.py: the speedup meter; chat.py: the coloured answer.
- story.py: one step told in words; microscope.py: one step's rows read, tree built and verdict.
- replay.py: an answer as one self-contained HTML replay; race.py: the race of the two methods, from a trace.

Reads `tr_core`'s events and traces; `tr_core` never imports this package. `python -m present replay TRACE OUT`
draws a trace saved by `python -m tr_core generate --trace TRACE` as an offline HTML replay.
"""
