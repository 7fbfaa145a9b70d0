"""Results into words and pictures: the text report, CSV, labels in three languages, Plotly figures."""
