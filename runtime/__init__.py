"""What a running loop uses from the process around it: its place in a job and the collectives (ranks; a torchrun
job's process group in distributed, never imported by one process), the stop signals, the console and progress bar."""
