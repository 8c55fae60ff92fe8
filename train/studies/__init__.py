"""Studies that train and compare many models, with their shell scripts: Table 1 (table1, tune),
Elman's grammar (elman_study, elman_neural), the Occam-gated LSTM (occam_study) and the token runs."""
