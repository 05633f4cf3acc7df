"""`gpumon doctor`: one check per thing gpumon depends on, each with a stable id, a verdict and the fix."""
