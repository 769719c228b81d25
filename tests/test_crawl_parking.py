"""The parking lot in real crawls: nothing given up is lost, nothing parked runs early."""

from __future__ import annotations

import json
import os
import stat
import sys
import time
from datetime import datetime
from pathlib import Path

import pytest
import pytest_twisted
from scrapy import Request

from scrapy_retryafter.parkfile import ParkFile, iso
from scrapy_retryafter.testing.server import HostConfig

from .conftest import ADDON, ListSpider, crawl


def _records(path: Path) -> list[dict]:
    """The file's record lines (a file with nothing left in it is removed)."""
    if not path.exists():
        return []
    return [r for r in (json.loads(line) for line in path.read_text().splitlines() if line.strip()) if "url" in r]


def _when(record: dict) -> float:
    return datetime.fromisoformat(record["not_before"].replace("Z", "+00:00")).timestamp()


class OtherCallbackSpider(ListSpider):
    def parse_page(self, response):
        self.seen.append((response.url, response.status, response.meta.get("tag")))


@pytest_twisted.ensureDeferred
async def test_retry_after_over_the_cap_parks_every_request_until_the_hosts_time(server, tmp_path):
    capped = server.add_host(HostConfig(reject_first=10**6, penalty=0.01, retry_after="3600"))
    free = server.add_host(HostConfig())
    server.start()
    park_file = tmp_path / "parked.jsonl"
    settings = {**ADDON, "RETRY_AFTER_PARK_FILE": str(park_file), "CONCURRENT_REQUESTS_PER_DOMAIN": 1}
    requests = [Request(capped.url(f"/{i}"), headers={"Cookie": "session=s3cret"}) for i in range(6)]
    requests += [Request(free.url(f"/{i}")) for i in range(6)]
    started = time.monotonic()
    crawler = await crawl(requests, settings)
    assert time.monotonic() - started < 5
    assert len(crawler.spider.seen) == 6 and all(url.startswith(free.base_url) for url, _ in crawler.spider.seen)
    assert crawler.spider.failures == []  # postponed, not failed: no errback
    assert len(server.arrivals(capped)) == 1
    records = _records(park_file)
    assert sorted(r["url"] for r in records) == sorted(capped.url(f"/{i}") for i in range(6))
    assert {r["reason"] for r in records} == {"over_cap"}
    assert all(abs(_when(r) - (time.time() + 3600)) < 30 for r in records)
    assert stat.S_IMODE(os.stat(park_file).st_mode) == 0o600
    assert crawler.stats.get_value("retry_after/parked") == 6

    # A second run before not_before: nothing of that host is fetched, every record stays.
    crawler = await crawl([], settings)
    assert len(server.arrivals(capped)) == 1
    assert crawler.spider.seen == []
    assert len(_records(park_file)) == 6

    # A run after it (simulated by moving not_before to the past) fetches them all and empties the file.
    capped.config.reject_first = 0
    past = iso(time.time() - 1)
    park_file.write_text("".join(json.dumps({**r, "not_before": past}) + "\n" for r in records))
    (tmp_path / "retry_after.hosts.json").unlink()  # the host's refusal ended too
    crawler = await crawl([], settings)
    assert sorted(url for url, _ in crawler.spider.seen) == sorted(capped.url(f"/{i}") for i in range(6))
    assert {a.headers.get("cookie") for a in server.arrivals(capped, status=200)} == {"session=s3cret"}
    assert _records(park_file) == []
    assert crawler.stats.get_value("retry_after/unparked") == 6


@pytest_twisted.ensureDeferred
async def test_a_record_due_soon_is_held_until_its_not_before(server, tmp_path):
    host = server.add_host(HostConfig())
    server.start()
    park_file = tmp_path / "parked.jsonl"
    spider = OtherCallbackSpider()
    request = Request(host.url("/soon"), callback=spider.parse_page, meta={"tag": "kept"}, method="PUT", body=b"\x00\xff")
    with ParkFile(park_file) as lot:
        from scrapy_retryafter.parkfile import ParkRecord, encode_value

        lot.add(ParkRecord(
            url=request.url, slot=host.address, reason="retries_exhausted", attempts=5,
            not_before=time.time() + 1.5, request=encode_value(request.to_dict(spider=spider)), spider="list",
        ))
    started = time.monotonic()
    crawler = await crawl([], {**ADDON, "RETRY_AFTER_PARK_FILE": str(park_file)}, spider_cls=OtherCallbackSpider)
    assert crawler.spider.seen == [(host.url("/soon"), 200, "kept")]
    (arrival,) = server.arrivals(host)
    assert arrival.method == "PUT"
    assert 1.4 <= arrival.t - started < 4
    assert _records(park_file) == []


@pytest_twisted.ensureDeferred
async def test_exhausted_retries_and_a_spent_budget_are_parked_but_a_bare_post_fails(server, tmp_path):
    host = server.add_host(HostConfig(status=503, reject_first=10**6, penalty=0.0, retry_after="absent"))
    server.start()
    park_file = tmp_path / "parked.jsonl"
    settings = {
        **ADDON, "RETRY_AFTER_PARK_FILE": str(park_file), "RETRY_AFTER_MAX_RETRIES": 1,
        "RETRY_AFTER_BACKOFF_BASE": 0.05, "RETRY_AFTER_BACKOFF_MAX": 0.1, "RETRY_AFTER_WAKE_JITTER": 0,
        "CONCURRENT_REQUESTS_PER_DOMAIN": 1,
    }
    requests = [Request(host.url("/get")), Request(host.url("/post"), method="POST", body=b"x")]
    crawler = await crawl(requests, settings)
    records = _records(park_file)
    assert [r["url"] for r in records] == [host.url("/get")]
    assert records[0]["reason"] in {"retries_exhausted", "budget_spent"}
    assert records[0]["attempts"] == 2
    # The POST may have run: it fails to the spider as Scrapy would, unparked.
    assert len(crawler.spider.failures) == 1
    assert crawler.spider.failures[0].request.url == host.url("/post")


@pytest.mark.parametrize("method", ["POST", "PATCH"])
@pytest_twisted.ensureDeferred
async def test_a_bare_post_over_the_cap_is_never_parked_but_one_with_a_key_is(server, tmp_path, caplog, method):
    bare = server.add_host(HostConfig(status=503, reject_first=10**6, penalty=0.01, retry_after="3600"))
    keyed = server.add_host(HostConfig(status=503, reject_first=10**6, penalty=0.01, retry_after="3600"))
    server.start()
    park_file = tmp_path / "parked.jsonl"
    settings = {**ADDON, "RETRY_AFTER_PARK_FILE": str(park_file)}
    requests = [
        Request(bare.url("/bare"), method=method, body=b"x"),
        Request(keyed.url("/keyed"), method=method, body=b"x", headers={"Idempotency-Key": "k1"}),
    ]
    crawler = await crawl(requests, settings)
    assert len(server.arrivals(bare)) == len(server.arrivals(keyed)) == 1
    # The bare one was answered 503 and may have run: never parked, so never replayed.
    records = _records(park_file)
    assert [r["url"] for r in records] == [keyed.url("/keyed")]
    assert records[0]["reason"] == "over_cap"
    (failure,) = crawler.spider.failures
    assert failure.request.url == bare.url("/bare")
    assert failure.value.response.status == 503  # Scrapy's HttpError, as without the add-on
    (line,) = [r.getMessage() for r in caplog.records if r.getMessage().startswith("Gave up") and "/bare" in r.getMessage()]
    assert f"{method} without Idempotency-Key" in line and "repeating it could apply it twice" in line
    assert "over the 300s cap" in line
    # The slot is still refused until the host's time.
    assert crawler.stats.get_value("retry_after/parked") == 1


@pytest_twisted.ensureDeferred
async def test_a_request_that_cannot_be_serialized_is_parked_by_its_url(server, tmp_path, caplog):
    host = server.add_host(HostConfig(reject_first=10**6, penalty=0.01, retry_after="3600"))
    server.start()
    park_file = tmp_path / "parked.jsonl"

    class LambdaSpider(ListSpider):
        async def start(self):
            yield Request(host.url("/lambda"), callback=lambda response: None)

    await crawl([], {**ADDON, "RETRY_AFTER_PARK_FILE": str(park_file)}, spider_cls=LambdaSpider)
    (record,) = _records(park_file)
    assert record["url"] == host.url("/lambda") and record["request"] is None
    assert any("as its URL only" in r.getMessage() and host.url("/lambda") in r.getMessage() for r in caplog.records)


@pytest_twisted.ensureDeferred
async def test_parking_off_gives_scrapys_usual_give_up(server, tmp_path):
    host = server.add_host(HostConfig(reject_first=10**6, penalty=0.01, retry_after="3600"))
    server.start()
    park_file = tmp_path / "parked.jsonl"
    crawler = await crawl([Request(host.url("/"))], {**ADDON, "RETRY_AFTER_PARK_FILE": str(park_file), "RETRY_AFTER_PARKING": False})
    assert len(crawler.spider.failures) == 1
    assert not park_file.exists()


@pytest_twisted.ensureDeferred
async def test_jobdir_keeps_the_park_file_inside_the_job(server, tmp_path):
    host = server.add_host(HostConfig(reject_first=10**6, penalty=0.01, retry_after="3600"))
    server.start()
    jobdir = tmp_path / "job"
    await crawl([Request(host.url("/"))], {**ADDON, "JOBDIR": str(jobdir)})
    (record,) = _records(jobdir / "retry_after.parked.jsonl")
    assert record["url"] == host.url("/")


@pytest.mark.parametrize(
    "mode",
    [ADDON, {"DOWNLOADER_MIDDLEWARES": {"scrapy_retryafter.RetryAfterMiddleware": 560}}],
    ids=["add-on", "middleware only"],
)
@pytest_twisted.ensureDeferred
async def test_stopping_during_a_cooldown_parks_what_was_held_in_either_mode(server, tmp_path, mode):
    host = server.add_host(HostConfig(reject_first=1, penalty=60.0))
    server.start()
    from scrapy.crawler import CrawlerRunner
    from scrapy.utils.defer import deferred_from_coro
    from twisted.internet import reactor, task

    from .conftest import BASE_SETTINGS

    park_file = tmp_path / "parked.jsonl"
    settings = {**BASE_SETTINGS, **mode, "RETRY_AFTER_PARK_FILE": str(park_file), "CONCURRENT_REQUESTS_PER_DOMAIN": 2}
    crawler = CrawlerRunner(settings).create_crawler(ListSpider)
    done = crawler.crawl(requests=[Request(host.url(f"/{i}")) for i in range(4)])
    await task.deferLater(reactor, 1.0, lambda: None)
    stopping = time.monotonic()
    stop = getattr(crawler, "stop_async", None)
    await (deferred_from_coro(stop()) if stop else crawler.stop())
    await done
    assert time.monotonic() - stopping < 3
    records = _records(park_file)
    # Held in the scheduler (add-on) or in the middleware (alone): parked either way, never failed.
    held = {r["url"] for r in records}
    assert host.url("/0") in held and {r["reason"] for r in records} == {"held_at_close"}
    assert crawler.spider.failures == []
    assert all(_when(r) > time.time() + 30 for r in records)


# -- many crawlers in one process, lifetime ----------------------------------------------------


class OtherSpider(ListSpider):
    name = "other"


class FailingPipeline:
    @classmethod
    def from_crawler(cls, crawler):
        raise RuntimeError("this crawl fails while it opens")


@pytest_twisted.ensureDeferred
async def test_crawlers_built_before_their_spider_and_one_that_failed_to_open_share_nothing(server, tmp_path, monkeypatch):
    from scrapy.utils.test import get_crawler

    from .conftest import BASE_SETTINGS

    capped = server.add_host(HostConfig(reject_first=10**6, penalty=0.01, retry_after="3600"))
    server.start()
    monkeypatch.chdir(tmp_path)  # the default park file is under ./.scrapy
    settings = {**BASE_SETTINGS, **ADDON}
    first, second, other = get_crawler(ListSpider, settings), get_crawler(ListSpider, settings), get_crawler(OtherSpider, settings)
    broken = get_crawler(ListSpider, {**settings, "ITEM_PIPELINES": {FailingPipeline: 100}})
    with pytest.raises(RuntimeError, match="fails while it opens"):
        await broken.crawl(requests=[Request(capped.url("/never"))])
    assert os.listdir(tmp_path) == []  # built, and one crawl failed: nothing on disk

    await second.crawl(requests=[Request(capped.url(f"/{i}")) for i in range(3)])
    park_file = tmp_path / ".scrapy" / "retry_after" / "list.parked.jsonl"
    assert sorted(r["url"] for r in _records(park_file)) == [capped.url(f"/{i}") for i in range(3)]
    assert {r["spider"] for r in _records(park_file)} == {"list"}

    capped.config.reject_first = 0
    await other.crawl(requests=[])
    assert other.spider.seen == []  # another spider's parked requests are not its own
    past = iso(time.time() - 1)
    park_file.write_text("".join(json.dumps({**r, "not_before": past}) + "\n" for r in _records(park_file)))
    (park_file.parent / "retry_after.hosts.json").unlink()  # the host's refusal ended too
    await first.crawl(requests=[])
    assert sorted(url for url, _ in first.spider.seen) == [capped.url(f"/{i}") for i in range(3)]
    assert not park_file.exists()
    # The per-host state file's lock stays (removing a lock file another process may hold is a race).
    assert sorted(os.listdir(tmp_path / ".scrapy" / "retry_after")) == ["retry_after.hosts.json.lock"]


@pytest_twisted.ensureDeferred
async def test_a_park_path_that_is_a_directory_fails_at_start_naming_the_setting(server, tmp_path):
    from scrapy_retryafter.settings import RetryAfterSettingError

    server.start()
    with pytest.raises(RetryAfterSettingError, match=r"RETRY_AFTER_PARK_FILE: .* is a directory"):
        await crawl([], {**ADDON, "RETRY_AFTER_PARK_FILE": str(tmp_path)})


@pytest_twisted.ensureDeferred
async def test_a_spider_without_a_name_parks_nothing_and_its_requests_reach_the_errback(server, tmp_path, caplog):
    capped = server.add_host(HostConfig(reject_first=10**6, penalty=0.01, retry_after="3600"))
    server.start()

    class Nameless(ListSpider):
        name = "nameless"

        def __init__(self, *args, **kwargs):
            super().__init__(*args, **kwargs)
            self.name = ""

    crawler = await crawl([Request(capped.url("/a"))], {**ADDON}, spider_cls=Nameless)
    assert [f.request.url for f in crawler.spider.failures] == [capped.url("/a")]
    assert any(r.levelname == "ERROR" and "the spider has no name" in r.getMessage() for r in caplog.records)


# -- a full disk -------------------------------------------------------------------------------


@pytest.fixture
def small_disk(tmp_path):
    import subprocess

    mount = tmp_path / "disk"
    mount.mkdir()
    done = subprocess.run(["mount", "-t", "tmpfs", "-o", "size=16k", "tmpfs", str(mount)], capture_output=True, check=False)
    if done.returncode != 0:
        pytest.skip(f"cannot mount a small tmpfs here: {done.stderr.decode().strip()}")
    yield mount
    subprocess.run(["umount", str(mount)], check=False)


@pytest_twisted.ensureDeferred
async def test_on_a_full_disk_every_request_is_parked_whole_or_reaches_the_errback(server, small_disk):
    from scrapy_retryafter.parkfile import read_log

    capped = server.add_host(HostConfig(reject_first=10**6, penalty=0.01, retry_after="3600"))
    server.start()
    park_file = small_disk / "parked.jsonl"
    requests = [Request(capped.url(f"/{i}"), method="PUT", body=b"x" * 3000) for i in range(8)]
    # RETRY_ENABLED off: until the give-up path catches the OSError from park(), Scrapy's
    # RetryMiddleware retries it as an IOError (with its backoffs, about 90 s here).
    settings = {**ADDON, "RETRY_AFTER_PARK_FILE": str(park_file), "CONCURRENT_REQUESTS_PER_DOMAIN": 1, "RETRY_ENABLED": False}
    crawler = await crawl(requests, settings)
    fold = read_log(park_file)
    parked = sorted(entry.url for entry in fold.records.values())
    failed = sorted(f.request.url for f in crawler.spider.failures)
    assert fold.bad == [] and parked and failed
    assert sorted(parked + failed) == sorted(r.url for r in requests)
    assert all(entry.record().request["body"] for entry in fold.records.values())
    # No temporary file left; the per-host state file (a few hundred bytes) and its lock fit.
    assert sorted(os.listdir(small_disk)) == ["parked.jsonl", "retry_after.hosts.json", "retry_after.hosts.json.lock"]


@pytest_twisted.ensureDeferred
async def test_a_compaction_on_a_full_disk_leaves_the_file_as_it_is_and_is_told_once(server, small_disk, monkeypatch, caplog):
    from scrapy_retryafter import parking
    from scrapy_retryafter.parkfile import ParkRecord, read_log

    monkeypatch.setattr(parking, "_FLUSH_INTERVAL", 0.2)
    monkeypatch.setattr(parking, "_COMPACT_AFTER", 1)  # a compaction tried at every flush
    free = server.add_host(HostConfig())
    server.start()
    park_file = small_disk / "parked.jsonl"
    urls = [free.url(f"/{i}") for i in range(12)]
    with ParkFile(park_file) as lot:
        lot.add_many([ParkRecord(url=url, slot="127.0.0.1", reason="over_cap", detail="x" * 600, attempts=1,
                                 not_before=time.time() - 1, request=None) for url in urls])
    room = os.statvfs(small_disk)
    filler = small_disk / "filler"
    filler.write_bytes(b"x" * (room.f_bavail * room.f_frsize))  # removals fit in the file's last page, a copy not
    settings = {**ADDON, "RETRY_AFTER_PARK_FILE": str(park_file), "CONCURRENT_REQUESTS_PER_DOMAIN": 1,
                "RETRY_AFTER_HOST_STATE": False, "DOWNLOAD_DELAY": 0.2}  # about a dozen flushes
    crawler = await crawl([], settings)
    assert sorted(url for url, _ in crawler.spider.seen) == sorted(urls)
    assert sorted(a.path for a in server.arrivals(free, status=200)) == sorted(f"/{i}" for i in range(12))
    errors = [r.getMessage() for r in caplog.records if r.levelname == "ERROR"]
    assert len(errors) == 1 and "the disk is full" in errors[0], errors  # tried at every flush, told once
    assert read_log(park_file).records == {}  # every removal landed (the last compaction, to nothing, removes the file)
    assert sorted(os.listdir(small_disk)) in (["filler"], ["filler", "parked.jsonl"])  # no temporary file


# -- hostile records ---------------------------------------------------------------------------


def _hostile(park_file: Path, **fields) -> None:
    record = {"id": fields.pop("id"), "spider": "list", "url": "http://127.0.0.1:1/", "slot": "127.0.0.1", "reason": "over_cap",
              "detail": "", "attempts": 1, "not_before": iso(time.time() - 1), "request": None, **fields}
    with open(park_file, "a") as out:
        out.write(json.dumps(record) + "\n")
    os.chmod(park_file, 0o600)


@pytest_twisted.ensureDeferred
async def test_a_torn_file_planted_by_another_user_sends_set_aside_lines_to_a_file_of_our_own(server, tmp_path, caplog):
    if os.geteuid() != 0:
        pytest.skip("making a file of another user needs root")
    host = server.add_host(HostConfig())
    server.start()
    park_file = tmp_path / "parked.jsonl"
    planted = tmp_path / "parked.jsonl.torn"
    planted.write_text("planted\n")
    os.chown(planted, 54321, 54321)
    good = host.url("/good")
    _hostile(park_file, id="good", url=good, request={"url": good, "callback": "parse", "method": "GET"})
    _hostile(park_file, id="data", url="data:text/plain,the data URL's contents")
    crawler = await crawl([], {**ADDON, "RETRY_AFTER_PARK_FILE": str(park_file)})
    assert crawler.spider.seen == [(good, 200)]
    ours = [name for name in os.listdir(tmp_path) if name.endswith(".torn") and name != planted.name]
    assert len(ours) == 1 and '"id": "data"' in (tmp_path / ours[0]).read_text()
    assert planted.read_text() == "planted\n"
    told = [r.getMessage() for r in caplog.records if "was refused" in r.getMessage()]
    assert len(told) == 1 and ours[0] in told[0] and "parked.jsonl.torn was refused" in told[0], told
    assert not park_file.exists()  # the good record handled, the bad one set aside: nothing left


@pytest_twisted.ensureDeferred
async def test_hostile_records_are_set_aside_with_a_warning_and_never_run(server, tmp_path, caplog, capsys):
    host = server.add_host(HostConfig())
    server.start()
    assert "this" not in sys.modules
    secret = tmp_path / "secret.txt"
    secret.write_text("the local file's contents")
    park_file = tmp_path / "parked.jsonl"
    good = host.url("/good")
    _hostile(park_file, id="good", url=good, request={"url": good, "callback": "parse", "method": "GET"})
    _hostile(park_file, id="file", url=secret.as_uri())
    _hostile(park_file, id="data", url="data:text/plain,the data URL's contents")
    _hostile(park_file, id="inner", url=host.url("/x"), request={"url": secret.as_uri()})
    _hostile(park_file, id="zen", url=host.url("/zen"), request={"url": host.url("/zen"), "_class": "this.s"})
    _hostile(park_file, id="notreq", url=host.url("/dict"), request={"url": host.url("/dict"), "_class": "collections.OrderedDict"})
    _hostile(park_file, id="attr", url=host.url("/attr"), request={"url": host.url("/attr"), "callback": "crawler"})
    _hostile(park_file, id="base", url=host.url("/base"), request={"url": host.url("/base"), "callback": "_set_crawler"})
    _hostile(park_file, id="static", url=host.url("/static"), request={"url": host.url("/static"), "errback": "close"})
    form = host.url("/form")
    _hostile(park_file, id="form", url=form, request={"url": form, "_class": "scrapy.http.request.form.FormRequest",
                                                      "callback": "parse", "errback": "failed", "method": "POST"})
    _hostile(park_file, id="year1", url=host.url("/year1"), not_before="0001-01-01T00:00:00Z")
    _hostile(park_file, id="body", url=host.url("/body"), request={"url": host.url("/body"), "body": {"$b64": "!!"}})
    _hostile(park_file, id="kwargs", url=host.url("/kwargs"),
             request={"url": host.url("/kwargs"), "callback": "parse", "cb_kwargs": {"$pairs": [[1, 2]]}})

    crawler = await crawl([], {**ADDON, "RETRY_AFTER_PARK_FILE": str(park_file)})
    assert sorted(crawler.spider.seen) == [(form, 200), (good, 200)]  # a FormRequest subclass is a Request
    assert sorted(a.path for a in server.arrivals(host)) == ["/form", "/good"]
    assert "Beautiful is better than ugly" not in capsys.readouterr().out
    assert "this" not in sys.modules  # refused before any import
    warnings = [r.getMessage() for r in caplog.records if r.levelname == "WARNING" and "set aside" in r.getMessage()]
    for record_id in ("file", "data", "inner", "zen", "notreq", "attr", "base", "static", "year1", "body", "kwargs"):
        assert sum(f"record {record_id} " in w for w in warnings) == 1, (record_id, warnings)
    torn = [json.loads(line)["id"] for line in park_file.with_name("parked.jsonl.torn").read_text().splitlines()]
    assert sorted(torn) == sorted(["file", "data", "inner", "zen", "notreq", "attr", "base", "static", "year1", "body", "kwargs"])
    assert not park_file.exists()



# -- symlinks planted where the park file, its old lock or a temporary file go -----------------


def _victim(path: Path) -> Path:
    path.write_text("precious\n")
    os.chmod(path, 0o644)
    return path


def _untouched(path: Path) -> bool:
    return path.read_text() == "precious\n" and stat.S_IMODE(path.stat().st_mode) == 0o644


@pytest_twisted.ensureDeferred
async def test_a_symlinked_park_file_is_refused_saying_why_and_its_target_untouched(server, tmp_path, caplog):
    capped = server.add_host(HostConfig(reject_first=10**6, penalty=0.01, retry_after="3600"))
    server.start()
    victim = _victim(tmp_path / "victim")
    park_file = tmp_path / "parked.jsonl"
    park_file.symlink_to(victim)
    # A default path (here JOBDIR's) is checked when the spider opens; parks then reach the errback.
    settings = {**ADDON, "RETRY_AFTER_PARK_FILE": None, "JOBDIR": str(tmp_path / "job"), "RETRY_ENABLED": False}
    (tmp_path / "job").mkdir()
    (tmp_path / "job" / "retry_after.parked.jsonl").symlink_to(victim)
    crawler = await crawl([Request(capped.url("/a"))], settings)
    assert _untouched(victim)
    assert [f.request.url for f in crawler.spider.failures] == [capped.url("/a")]
    assert any(r.levelname == "ERROR" and "is a symlink; refusing to follow it" in r.getMessage() for r in caplog.records)
    from scrapy_retryafter.settings import RetryAfterSettingError

    with pytest.raises(RetryAfterSettingError, match="is a symlink; refusing to follow it"):
        await crawl([], {**ADDON, "RETRY_AFTER_PARK_FILE": str(park_file)})
    assert _untouched(victim)


@pytest_twisted.ensureDeferred
async def test_symlinks_at_the_old_lock_and_temporary_names_are_never_followed(server, tmp_path):
    host = server.add_host(HostConfig())
    server.start()
    park_file = tmp_path / "parked.jsonl"
    with ParkFile(park_file) as lot:
        from scrapy_retryafter.parkfile import ParkRecord

        lot.add(ParkRecord(url=host.url("/due"), slot=host.address, reason="over_cap", attempts=1,
                           not_before=time.time() - 1, request=None, spider="list"))
    lock_victim, temporary_victim = _victim(tmp_path / "lock-victim"), _victim(tmp_path / "tmp-victim")
    (tmp_path / "parked.jsonl.lock").unlink(missing_ok=True)
    (tmp_path / "parked.jsonl.lock").symlink_to(lock_victim)
    (tmp_path / f".parked.jsonl.{os.getpid()}.tmp").symlink_to(temporary_victim)
    crawler = await crawl([], {**ADDON, "RETRY_AFTER_PARK_FILE": str(park_file)})
    assert crawler.spider.seen == [(host.url("/due"), 200)]
    assert _untouched(lock_victim) and _untouched(temporary_victim)
    assert not park_file.exists()


@pytest_twisted.ensureDeferred
async def test_a_file_of_garbage_gives_a_bounded_number_of_warnings_and_the_good_records(server, tmp_path, caplog):
    host = server.add_host(HostConfig())
    server.start()
    park_file = tmp_path / "parked.jsonl"
    with open(park_file, "w") as out:
        for i in range(500):
            out.write(f"garbage {i} \x1b[2J\n")
    os.chmod(park_file, 0o600)
    _hostile(park_file, id="good", url=host.url("/good"))
    crawler = await crawl([], {**ADDON, "RETRY_AFTER_PARK_FILE": str(park_file)})
    assert crawler.spider.seen == [(host.url("/good"), 200)]
    warnings = [r.getMessage() for r in caplog.records if r.levelname == "WARNING" and "Park file" in r.getMessage()]
    assert len(warnings) == 21 and "480 more unreadable line(s)" in warnings[-1]
    assert not any("\x1b" in w for w in warnings)
    assert crawler.stats.get_value("retry_after/park_file_set_aside") == 500
    assert len(park_file.with_name("parked.jsonl.torn").read_text().splitlines()) == 500


class HandlesThrottlesSpider(ListSpider):
    handle_httpstatus_list = [429]


@pytest.mark.parametrize(
    ("how", "meta", "settings", "spider_cls"),
    [
        ("meta list", {"handle_httpstatus_list": [429]}, {}, ListSpider),
        ("meta all", {"handle_httpstatus_all": True}, {}, ListSpider),
        ("spider attribute", {}, {}, HandlesThrottlesSpider),
        ("HTTPERROR_ALLOWED_CODES", {}, {"HTTPERROR_ALLOWED_CODES": [429]}, ListSpider),
        ("HTTPERROR_ALLOW_ALL", {}, {"HTTPERROR_ALLOW_ALL": True}, ListSpider),
    ],
)
@pytest_twisted.ensureDeferred
async def test_a_spider_that_handles_the_status_gets_the_last_response_instead_of_a_park(
    server, tmp_path, caplog, how, meta, settings, spider_cls
):
    host = server.add_host(HostConfig(reject_first=10**6, penalty=0.05))
    server.start()
    park_file = tmp_path / "parked.jsonl"
    settings = {**ADDON, "RETRY_AFTER_PARK_FILE": str(park_file), "RETRY_AFTER_MAX_RETRIES": 1,
                "RETRY_AFTER_WAKE_JITTER": 0, "RETRY_AFTER_ADAPTIVE": False, **settings}
    crawler = await crawl([Request(host.url("/limited"), meta=meta)], settings, spider_cls=spider_cls)
    assert [a.status for a in server.arrivals(host)] == [429, 429]  # retried as usual first
    assert crawler.spider.seen == [(host.url("/limited"), 429)]  # as stock Scrapy delivers it
    assert crawler.spider.failures == []
    assert _records(park_file) == []
    assert "passed to the spider, which handles 429 itself" in caplog.text


@pytest_twisted.ensureDeferred
async def test_a_spider_that_handles_another_status_still_has_the_exhausted_request_parked(server, tmp_path):
    host = server.add_host(HostConfig(reject_first=10**6, penalty=0.05))
    server.start()
    park_file = tmp_path / "parked.jsonl"
    settings = {**ADDON, "RETRY_AFTER_PARK_FILE": str(park_file), "RETRY_AFTER_MAX_RETRIES": 1,
                "RETRY_AFTER_WAKE_JITTER": 0, "RETRY_AFTER_ADAPTIVE": False, "HTTPERROR_ALLOWED_CODES": [404]}
    crawler = await crawl([Request(host.url("/limited"))], settings)
    assert crawler.spider.seen == [] and crawler.spider.failures == []
    assert [r["reason"] for r in _records(park_file)] == ["retries_exhausted"]


@pytest_twisted.ensureDeferred
async def test_a_park_file_refused_at_open_is_explained_once_not_at_every_request(server, tmp_path, caplog):
    # Each refused park repeated the whole refusal (hundreds of characters) on its own ERROR line.
    capped = server.add_host(HostConfig(reject_first=10**6, penalty=0.01, retry_after="3600"))
    server.start()
    victim = _victim(tmp_path / "victim")
    (tmp_path / "job").mkdir()
    (tmp_path / "job" / "retry_after.parked.jsonl").symlink_to(victim)
    settings = {**ADDON, "RETRY_AFTER_PARK_FILE": None, "JOBDIR": str(tmp_path / "job"), "RETRY_ENABLED": False}
    urls = [capped.url(f"/{n}") for n in range(3)]
    crawler = await crawl([Request(url) for url in urls], settings)
    assert sorted(f.request.url for f in crawler.spider.failures) == sorted(urls)
    errors = [r.getMessage() for r in caplog.records if r.levelname == "ERROR"]
    assert sum("is a symlink; refusing to follow it" in message for message in errors) == 1
    could_not = [message for message in errors if message.startswith("Could not park")]
    assert len(could_not) == 3 and all("refused when the spider opened" in m for m in could_not)
