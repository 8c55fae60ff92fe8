"""Every model other than the ISAN core that the engine runs, behind one runner interface.

A runner has ``kind, K, V, d, state_size, state_names, backend, provider``, ``initial_state()``,
``score_ids(ids, state)`` and ``score_batch(ids_list, states)``; :class:`RunnerEngine`
(:mod:`isan.engine.runners.recurrent`) gives any runner the :class:`isan.engine.Engine` API.

- :mod:`~isan.engine.runners.recurrent`: tanh RNN, IRNN, GRU, LSTM (numpy references) and RunnerEngine
- :mod:`~isan.engine.runners.linear`: the linear controls of Table 1
- :mod:`~isan.engine.runners.reservoir`: ESN and NPM (Cernansky et al. 2008)
- :mod:`~isan.engine.runners.occam`: the Occam-gated LSTM (Raiman and Sidor)
- :mod:`~isan.engine.runners.ngram`: the Kneser-Ney n-gram's model and scoring (counting: :mod:`isan.train.ngram`)
- :mod:`~isan.engine.runners.onnx`: any bundle's ONNX graphs under onnxruntime (``--backend onnx``)
"""
