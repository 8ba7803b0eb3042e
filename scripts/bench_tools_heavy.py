"""The benchmark's tools in a module that imports a heavy standard-library set at its top, as tool
modules that parse, fetch and store things do. Same tools as `bench_tools`."""

from __future__ import annotations

import asyncio  # noqa: F401
import csv  # noqa: F401
import decimal  # noqa: F401
import email.parser  # noqa: F401
import http.client  # noqa: F401
import json  # noqa: F401
import logging.handlers  # noqa: F401
import multiprocessing  # noqa: F401
import sqlite3  # noqa: F401
import tarfile  # noqa: F401
import urllib.request  # noqa: F401
import xml.etree.ElementTree  # noqa: F401
import zipfile  # noqa: F401

from bench_tools import TOOLS, echo_fn, spin_fn

__all__ = ["TOOLS", "echo_fn", "spin_fn"]
