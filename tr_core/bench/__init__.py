"""Benchmarking, above the library and below the command line (`bench`, `profile`); `import tr_core` loads none of it.

bench.py runs the methods on question sets (questions.py), answers.py times one answer, results.py makes the JSON
document, tables.py shows it, concurrency.py measures N prompts at once, profile.py the forward cost t(N)/t(1).
"""
