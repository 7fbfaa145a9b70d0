"""What only the app needs: the device queue, background jobs, the URL query, shared runs, exercises."""
