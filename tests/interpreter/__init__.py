"""Tests of the tile interpreter (tkc.interpreter): per-op semantics and control flow over lanes."""
