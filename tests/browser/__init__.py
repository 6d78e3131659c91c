"""Helpers of the browser tier (tests/test_browser.py): a JupyterLab server and a notebook page driver."""
