"""Benchmarking: Token Recycling against plain decoding and its peers on question sets (bench.py runs them, Spec-Bench
style; answers.py times one answer; results.py makes the JSON document and bounds a plausible speedup; tables.py shows
it, one run or a folder of them; concurrency.py: N prompts at once against one after another), the forward cost curve
t(N)/t(1) (profile.py) and the question files both read (questions.py).

Above the library, below the command line (tr_core.cli: `bench`, `profile`);
`import tr_core` loads none of this.
"""
