"""Every model other than the ISAN core that the engine runs, behind one interface (renamed from ``isan.engine.runners`` in issue #46, so that
"runner" means one thing in the engine: :class:`isan.engine.kernels.chunked.Runner`).

A baseline model has ``kind, K, V, d, state_size, state_names, backend, provider``, ``initial_state()``,
``score_ids(ids, state)`` and ``score_batch(ids_list, states)``; :class:`RunnerEngine`
(:mod:`isan.engine.baselines.recurrent`) gives any of them the :class:`isan.engine.Engine` API.

- :mod:`~isan.engine.baselines.recurrent`: tanh RNN, IRNN, GRU, LSTM (numpy references) and RunnerEngine
- :mod:`~isan.engine.baselines.linear`: the linear controls of Table 1
- :mod:`~isan.engine.baselines.reservoir`: ESN and NPM (Cernansky et al. 2008)
- :mod:`~isan.engine.baselines.occam`: the Occam-gated LSTM (Raiman and Sidor)
- :mod:`~isan.engine.baselines.ngram`: the Kneser-Ney n-gram's model and scoring (counting: :mod:`isan.train.ngram`)
- :mod:`~isan.engine.baselines.onnx`: any bundle's ONNX graphs under onnxruntime (``--runtime onnx``)
"""
