#!/usr/bin/env python3
"""A small Wyoming client (written from the protocol's README: a JSON header line, optional extra data, optional
binary payload) for tandem-http's tests, standard library only.

  wyoming_client.py HOST PORT describe
  wyoming_client.py HOST PORT transcribe WAV [--model M] [--chunk-ms 20] [--context JSON]
  wyoming_client.py HOST PORT raw HEX|-        (sends the bytes, or stdin's, prints the events until the server closes)

Prints one JSON object: the events received (and for transcribe the transcript's text and the chunks' texts)."""
import json
import socket
import sys
import wave


def send(sock, etype, data=None, payload=b""):
    header = {"type": etype}
    extra = b""
    if data:
        extra = json.dumps(data).encode()
        header["data_length"] = len(extra)
    if payload:
        header["payload_length"] = len(payload)
    sock.sendall(json.dumps(header).encode() + b"\n" + extra + payload)


def read_event(f):
    line = f.readline()
    if not line:
        return None
    h = json.loads(line)
    data = h.get("data") or {}
    if h.get("data_length"):
        data.update(json.loads(f.read(h["data_length"])))
    payload = f.read(h["payload_length"]) if h.get("payload_length") else b""
    return {"type": h["type"], "data": data, "payload_length": len(payload)}


def main():
    host, port, cmd = sys.argv[1], int(sys.argv[2]), sys.argv[3]
    sock = socket.create_connection((host, port), timeout=60)
    f = sock.makefile("rb")
    out = {"events": []}
    if cmd == "describe":
        send(sock, "describe")
        out["events"].append(read_event(f))
    elif cmd == "transcribe":
        args = sys.argv[4:]
        wav = args[0]
        model, chunk_ms, context = None, 20, None
        i = 1
        while i < len(args):
            if args[i] == "--model":
                model = args[i + 1]
            elif args[i] == "--chunk-ms":
                chunk_ms = int(args[i + 1])
            elif args[i] == "--context":
                context = json.loads(args[i + 1])
            i += 2
        with wave.open(wav, "rb") as w:
            rate, width, channels = w.getframerate(), w.getsampwidth(), w.getnchannels()
            pcm = w.readframes(w.getnframes())
        t = {}
        if model:
            t["name"] = model
        if context:
            t["context"] = context
        send(sock, "transcribe", t)
        fmt = {"rate": rate, "width": width, "channels": channels}
        send(sock, "audio-start", fmt)
        step = rate * width * channels * chunk_ms // 1000
        for off in range(0, len(pcm), step):
            send(sock, "audio-chunk", fmt, pcm[off:off + step])
        send(sock, "audio-stop")
        chunks = []
        while True:
            e = read_event(f)
            if e is None:
                break
            out["events"].append(e)
            if e["type"] == "transcript-chunk":
                chunks.append(e["data"].get("text", ""))
            if e["type"] in ("transcript", "error"):
                if e["type"] == "transcript":
                    out["text"] = e["data"].get("text", "")
                    # transcript-stop follows when chunks were sent
                    if chunks:
                        out["events"].append(read_event(f))
                break
        out["chunks"] = chunks
    elif cmd == "raw":
        sock.sendall(sys.stdin.buffer.read() if sys.argv[4] == "-" else bytes.fromhex(sys.argv[4]))
        while True:
            try:
                e = read_event(f)
            except (ValueError, socket.timeout):
                break
            if e is None:
                break
            out["events"].append(e)
        out["closed"] = True
    print(json.dumps(out))


if __name__ == "__main__":
    main()
