"""What the course knows of each backend, one home per backend: its tables first, then its
rules with their words beside them, then the readers of what ran.

- ``x86``: ``X86InductorQuantizer`` and inductor's oneDNN lowering.
- ``xnnpack``: ``XNNPACKQuantizer``, the ops XNNPACK's partitioner takes, and its runtime.
- ``openvino``: ``OpenVINOQuantizer`` and OpenVINO's CPU plugin.
- ``arm``: ``ArmInductorQuantizer``.

The backend-neutral reports (``common.coverage``, ``common.atlas``) ask these modules; a
lesson imports the reports.
"""
