"""accel's test programs that need libraries beyond torch (Hugging Face datasets...)."""
