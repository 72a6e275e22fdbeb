#!/usr/bin/env python3
"""serve_bench.py - a bounded load generator for OpenAI-compatible servers
(kvtop serve, llama.cpp's llama-server, vLLM): N concurrent streaming
/v1/completions clients, each sending its next request when the last one
ends (closed loop), with prompts of about --prompt-tokens tokens and
exactly --output-tokens output tokens (ignore_eos). Reports what vLLM's
`bench serve` reports: output tokens/s, requests/s, TTFT, TPOT and ITL at
P50 and P99 (ms), and goodput (requests/s meeting --sla-ttft-ms and
--sla-tpot-ms). Standard library only (asyncio streams), so the client's
own cost stays small next to the servers'.

  tools/serve_bench.py --url http://127.0.0.1:8000 --concurrency 1,8,32,64 \\
      --requests-per-client 2 [--api-key KEY] [--json out.json] [--label kvtop]

Every request has a timeout; the run is bounded by concurrency x
requests-per-client requests per level.
"""
import argparse
import asyncio
import json
import statistics
import sys
import time
import urllib.parse

WORDS = ("the quick brown fox jumps over a lazy dog while seven bright stars watch the quiet river "
         "flow past old stone bridges and green fields of summer wheat").split()


def prompt_text(i, n_tokens):
    # about one token a word for this vocabulary of common words
    w = [WORDS[(i * 7 + k * 3) % len(WORDS)] for k in range(n_tokens)]
    return f"Request {i}. " + " ".join(w)


def pct(v, p):
    if not v:
        return None
    v = sorted(v)
    k = (len(v) - 1) * p / 100
    lo, hi = int(k), min(int(k) + 1, len(v) - 1)
    return v[lo] + (v[hi] - v[lo]) * (k - lo)


async def one_request(host, port, path, headers, body, timeout):
    """Streams one completion; returns (ttft_s, [itl_s], n_tokens, e2e_s) or raises."""
    t0 = time.perf_counter()
    reader, writer = await asyncio.wait_for(asyncio.open_connection(host, port), timeout)
    try:
        data = json.dumps(body).encode()
        head = (f"POST {path} HTTP/1.1\r\nHost: {host}\r\nContent-Type: application/json\r\n"
                f"Content-Length: {len(data)}\r\nConnection: close\r\n{headers}\r\n").encode()
        writer.write(head + data)
        await writer.drain()
        status = await asyncio.wait_for(reader.readline(), timeout)
        if b" 200 " not in status:
            raise RuntimeError(status.decode(errors="replace").strip())
        chunked = False
        while True:
            h = await asyncio.wait_for(reader.readline(), timeout)
            if h in (b"\r\n", b"\n", b""):
                break
            if h.lower().startswith(b"transfer-encoding:") and b"chunked" in h.lower():
                chunked = True

        async def body_parts():
            """The body's bytes as they come, with chunked encoding undone."""
            while True:
                if not chunked:
                    part = await asyncio.wait_for(reader.read(65536), timeout)
                    if not part:
                        return
                    yield part
                    continue
                size = int((await asyncio.wait_for(reader.readline(), timeout)).split(b";")[0].strip() or b"0", 16)
                if size == 0:
                    return
                yield await asyncio.wait_for(reader.readexactly(size), timeout)
                await asyncio.wait_for(reader.readline(), timeout)

        ttft, last, itl, n_tok, usage_tok = None, None, [], 0, None
        buf = b""
        async for chunk in body_parts():
            buf += chunk
            while b"\n" in buf:
                line, buf = buf.split(b"\n", 1)
                line = line.strip()
                if not line.startswith(b"data: "):
                    continue
                payload = line[6:]
                if payload == b"[DONE]":
                    continue
                try:
                    ev = json.loads(payload)
                except ValueError:
                    continue
                if ev.get("usage"):
                    usage_tok = ev["usage"].get("completion_tokens")
                for ch in ev.get("choices") or []:
                    if ch.get("text"):
                        now = time.perf_counter()
                        if ttft is None:
                            ttft = now - t0
                        else:
                            itl.append(now - last)
                        last = now
                        n_tok += 1
        e2e = time.perf_counter() - t0
        return ttft, itl, usage_tok or n_tok, e2e
    finally:
        writer.close()


async def run_level(url, conc, per_client, args):
    u = urllib.parse.urlparse(url)
    host, port = u.hostname, u.port or 80
    headers = f"Authorization: Bearer {args.api_key}\r\n" if args.api_key else ""
    results, errors = [], []

    async def client(c):
        for r in range(per_client):
            i = c * per_client + r
            body = {"model": args.model, "prompt": prompt_text(i, args.prompt_tokens), "max_tokens": args.output_tokens,
                    "temperature": 0, "stream": True, "ignore_eos": True,
                    "stream_options": {"include_usage": True}}
            try:
                results.append(await one_request(host, port, "/v1/completions", headers, body, args.timeout))
            except Exception as e:  # noqa: BLE001
                errors.append(repr(e)[:120])

    t0 = time.perf_counter()
    await asyncio.gather(*[client(c) for c in range(conc)])
    dur = time.perf_counter() - t0
    ttft = [r[0] * 1e3 for r in results if r[0] is not None]
    tpot = [(r[3] - r[0]) / (r[2] - 1) * 1e3 for r in results if r[0] is not None and r[2] > 1]
    itl = [x * 1e3 for r in results for x in r[1]]
    out_tok = sum(r[2] for r in results)
    good = sum(1 for r in results if r[0] is not None and r[0] * 1e3 <= args.sla_ttft_ms and r[2] > 1 and
               (r[3] - r[0]) / (r[2] - 1) * 1e3 <= args.sla_tpot_ms)
    return {"concurrency": conc, "requests": len(results), "errors": len(errors), "first_error": errors[:1],
            "duration_s": dur, "output_tok_s": out_tok / dur, "req_s": len(results) / dur,
            "ttft_p50_ms": pct(ttft, 50), "ttft_p99_ms": pct(ttft, 99), "tpot_p50_ms": pct(tpot, 50),
            "tpot_p99_ms": pct(tpot, 99), "itl_p50_ms": pct(itl, 50), "itl_p99_ms": pct(itl, 99),
            "goodput_req_s": good / dur, "mean_tokens": statistics.mean([r[2] for r in results]) if results else 0}


def fmt(v, f="%.1f"):
    return "-" if v is None else f % v


def main():
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--url", required=True)
    ap.add_argument("--model", default="")
    ap.add_argument("--api-key", default="")
    ap.add_argument("--concurrency", default="1,8,32,64")
    ap.add_argument("--requests-per-client", type=int, default=2)
    ap.add_argument("--prompt-tokens", type=int, default=128)
    ap.add_argument("--output-tokens", type=int, default=128)
    ap.add_argument("--sla-ttft-ms", type=float, default=2000)
    ap.add_argument("--sla-tpot-ms", type=float, default=100)
    ap.add_argument("--timeout", type=float, default=600)
    ap.add_argument("--label", default="")
    ap.add_argument("--json", default="")
    a = ap.parse_args()
    rows = []
    print(f"{a.label or a.url}: prompt ~{a.prompt_tokens}, output {a.output_tokens}, "
          f"SLA TTFT {a.sla_ttft_ms:.0f} ms / TPOT {a.sla_tpot_ms:.0f} ms")
    print("conc  reqs  err   out tok/s  req/s   TTFT p50/p99 ms   TPOT p50/p99 ms   ITL p50/p99 ms   goodput req/s")
    for c in [int(x) for x in a.concurrency.split(",")]:
        r = asyncio.run(run_level(a.url, c, a.requests_per_client, a))
        rows.append(r)
        print(f"{c:4d}  {r['requests']:4d}  {r['errors']:3d}  {r['output_tok_s']:10.1f}  {r['req_s']:5.2f}  "
              f"{fmt(r['ttft_p50_ms']):>7}/{fmt(r['ttft_p99_ms']):<7}  {fmt(r['tpot_p50_ms']):>7}/{fmt(r['tpot_p99_ms']):<7}  "
              f"{fmt(r['itl_p50_ms']):>6}/{fmt(r['itl_p99_ms']):<6}  {r['goodput_req_s']:.2f}", flush=True)
        if r["errors"]:
            print(f"      first error: {r['first_error']}")
    if a.json:
        with open(a.json, "w") as f:
            json.dump({"label": a.label, "url": a.url, "levels": rows}, f, indent=1)
    return 0 if all(r["errors"] == 0 for r in rows) else 1


if __name__ == "__main__":
    sys.exit(main())
