"""Benchmarking: Token Recycling against plain decoding and its peers on question sets (bench.py, Spec-Bench style),
the forward cost curve t(N)/t(1) (profile.py) and the question files both read (questions.py).

Above the library, below the command line (tr_core.cli: `bench`, `profile`);
`import tr_core` loads none of this.
"""
