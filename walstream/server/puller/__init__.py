"""The gRPC PullerService (`puller.proto`) beside the HTTP stream API; `service.py` serves it.
`puller_pb2*.py` are generated: `python -m grpc_tools.protoc -I. --python_out=. --pyi_out=.
--grpc_python_out=. walstream/server/puller/puller.proto` from the repository's root."""
