"""Chakra's execution-trace schema (the input format of ASTRA-sim), vendored.

Provenance: ``et_def.proto`` is ``schema/protobuf/et_def.proto`` of https://github.com/mlcommons/chakra
(mirrored as https://github.com/astra-sim/chakra) at commit 214f2c559c10f897bcc395f8e1502d80d14f1541,
the commit ASTRA-sim 2a2979a pins as ``extern/graph_frontend/chakra`` (MIT license; SHA-256 of the file
46b67392c6192561c146c14718cae5336c644d43cf5f96a1466028a89f3ab890). ``et_def_pb2.py`` and
``et_def_pb2.pyi`` were generated from it, unedited, with ``protoc 3.21.12`` (Debian's protobuf-compiler)::

    protoc et_def.proto --python_out=. --pyi_out=.

They need the ``protobuf`` runtime (>= 3.20); ``tests/test_chakra.py`` checks that the message and enum
numbers cosim writes are the ones of this schema. Regenerate with the same command after updating the
.proto (the file registers itself as ``et_def.proto`` in protobuf's default descriptor pool, as Chakra's
own generated module does).
"""
