"""`haliax._src.*`: the private Haliax module paths that ported code imports in practice.

Each module is a thin re-export of the Meltemi implementation; only the names Haliax code
imports from these paths are provided.
"""
