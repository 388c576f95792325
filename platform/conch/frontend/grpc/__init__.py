"""The gRPC frontend: Triton's GRPCInferenceService over the data plane (``server``)."""
