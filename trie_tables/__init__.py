"""isan.trie_tables."""
