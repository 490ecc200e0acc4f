"""The profiler: the one part of autoplan that builds torch modules and runs them.

``autoplan profile`` traces a model into layers (``model_profile.profile_model``) and writes a
``ModelProfile``; ``autoplan profile-hardware`` measures this machine (``hardware``) and writes a
``DeviceProfile`` and a ``Cluster``. ``adapter`` turns a profile into the planner's ``Workload`` and is the
only module here that does not need torch. Nothing is imported at package import time, so that the
planner can import ``autoplan.profiler.adapter`` without torch.
"""
