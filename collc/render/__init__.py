"""Pictures of timelines, shared by the tools: Chrome traces (chrome_trace) and the
matplotlib set-up (plots). Import the modules themselves; this file re-exports nothing."""
