"""The views of a decode: what the studio, `generate --replay-html` and the benchmark show of the engine's events.

- trace.py: a decode recorded (its events, texts and settings), saved, loaded and validated; `record_live`.
- speed.py: the honest speed meter, Token Recycling and plain decoding timed in alternating chunks.
- figures.py: the tree, heatmap and chart figures (plotly, networkx) and the coloured answer.
- story.py: one step told in words; microscope.py: one step's rows read, tree built and verdict.
- replay.py: an answer as one self-contained HTML replay; race.py: the race of the two methods, from a trace.

Needs the `report` extra (plotly, networkx) for the figures; `import tr_core` loads none of this.
"""
