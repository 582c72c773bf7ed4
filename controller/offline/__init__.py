"""The offline model: a scripted Responses server whose turns wait for what the screen shows."""
