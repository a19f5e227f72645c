"""Importers of models users bring (int8 ONNX) into the quantized graph builder."""
