PYTHON ?= python3
VENV := .venv
PY := $(VENV)/bin/python

.PHONY: venv test demo bench clean

# The venv is (re)built whenever pyproject.toml changes.
$(VENV)/.installed: pyproject.toml
	test -x $(PY) || $(PYTHON) -m venv $(VENV)
	$(PY) -m pip install -q --upgrade pip
	$(PY) -m pip install -q -e '.[dev]'
	touch $@

venv: $(VENV)/.installed

test: venv
	PYSPARK_PYTHON=$(abspath $(PY)) $(PY) -m pytest -q -p no:cacheprovider

demo: venv
	PYSPARK_PYTHON=$(abspath $(PY)) $(PY) jobs/demo.py

clean:
	rm -rf $(VENV) build *.egg-info spark-warehouse
