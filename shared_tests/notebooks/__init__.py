"""The course: its notebooks run, its exercises checked, JupyterLab opening it, the docs site showing it."""
