"""Tasks beside language modelling: the parentheses counting task (Foerster et al. 2017, section 4)
and Elman's grammar (Cernansky et al. 2008)."""
