"""Reading a job master's Prometheus endpoint in tests."""

from __future__ import annotations

import urllib.request

from prometheus_client.parser import text_string_to_metric_families


def scrape(url: str) -> dict[tuple[str, tuple[tuple[str, str], ...]], float]:
    with urllib.request.urlopen(url + "/metrics", timeout=10) as r:
        text = r.read().decode()
    samples = [s for family in text_string_to_metric_families(text) for s in family.samples]
    assert len({s.labels.get("job") for s in samples}) == 1 and "job" in samples[0].labels  # every series has it
    return {
        (s.name, tuple(sorted((k, v) for k, v in s.labels.items() if k != "job"))): s.value
        for family in text_string_to_metric_families(text)
        for s in family.samples
    }
