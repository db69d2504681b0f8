"""End-to-end training throughput: cosim's synthesized steps against published runs (``python -m validation.e2e.run``)."""
