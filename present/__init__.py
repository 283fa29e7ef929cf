"""The views of a decode: what the studio and the offline replay show of the engine's events.

- figures.py: the tree, heatmap and chart figures (plotly, networkx), the meter and the coloured answer.
- story.py: one step told in words; microscope.py: one step's rows read, tree built and verdict.
- replay.py: an answer as one self-contained HTML replay; race.py: the race of the two methods, from a trace.

Reads `tr_core`'s events and traces; `tr_core` never imports this package. `python -m present replay TRACE OUT`
draws a trace saved by `python -m tr_core generate --trace TRACE` as an offline HTML replay.
"""
