"""The paper's studies (Foerster et al. 2017), as numpy functions for any ISAN; see each module."""
