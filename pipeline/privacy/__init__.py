"""Privacy: budgets and accounting, mechanisms and noise, the certificate, releases."""
