"""DeepEP dispatch/combine validation against DeepEP's published tables."""
