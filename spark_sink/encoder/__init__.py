"""Arrow columns into Kafka record batches in compiled loops: the columnar encoder behind
``send_arrow`` (``columnar``), the loops it runs (``kernels``: the C extension built
with the wheel, else numba's ``jit``). Nothing is loaded until the first encode."""
