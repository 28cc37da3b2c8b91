#!/usr/bin/env bash
# Builds the job controllers and queueing engines users run beside Tideshift (filled in by issue 38).
set -euo pipefail
