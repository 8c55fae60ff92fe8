"""Benchmarks (``isan bench ...``): each prints a table with the machine, the command, medians over
repeats and ratios against a baseline run in the same process, and writes JSON only with --out.

- :mod:`~isan.bench.engine`: the engine's paths, table budgets and ONNX graphs, with KenLM and an
  onnxruntime LSTM as peers (``isan bench engine | budgets | onnx``)
- :mod:`~isan.bench.serve`: the load generator for ``isan-serve`` (``isan bench serve``)
- :mod:`~isan.bench.train`: training throughput of every model (``isan bench train``; needs torch)
"""
