"""Token Recycling Studio, the app's parts: settings, sessions, the model catalogue, handlers and the page.

`app.py` parses arguments and launches; `page.build_demo` lays out the page. Handlers are functions of
(session, inputs) that return what to show: `handlers` (each session's engine, a chat answer, the model and its
matrix) with `settings` (a request's settings, validated), `answer` (an answer's live views), `measure` (the speed
meter's measurement), `costs` (this machine's forward costs) and `traces` (replay, trace files, the HTML export).
`views` and `cost_panel` build what the page shows from plain data; `recording` records a live decode into a
trace; `session` holds the per-visitor state and the shared `Studio`; `models` the shared models; `config` the
operator's settings; `zerogpu` the GPU calls on a ZeroGPU Space.
"""
