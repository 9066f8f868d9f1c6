"""INT8 calibration (`edge-agent quantize`): data readers, the command and its report."""
