"""The MQTT adapter: falls back to 3.1.1 where the broker does not speak MQTT 5."""

from __future__ import annotations

import asyncio

from agent.wire.mqtt import MqttClient, MqttSettings, Protocol


async def _read_packet(reader: asyncio.StreamReader) -> tuple[int, bytes]:
    header = (await reader.readexactly(1))[0]
    length, shift = 0, 0
    while True:
        byte = (await reader.readexactly(1))[0]
        length |= (byte & 0x7F) << shift
        shift += 7
        if not byte & 0x80:
            break
    return header, await reader.readexactly(length)


def test_falls_back_to_mqtt_311() -> None:
    """A broker that only knows 3.1.1 refuses the MQTT 5 CONNECT (rc 1); the client retries."""
    levels: list[int] = []

    async def serve(reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        try:
            header, body = await _read_packet(reader)
            assert header >> 4 == 1  # CONNECT
            level = body[6]  # after the protocol name "MQTT"
            levels.append(level)
            if level != 4:
                writer.write(b"\x20\x02\x00\x01")  # unacceptable protocol version
                await writer.drain()
                return
            writer.write(b"\x20\x02\x00\x00")
            await writer.drain()
            while True:
                header, body = await _read_packet(reader)
                if header >> 4 == 8:  # SUBSCRIBE → SUBACK granted QoS 1
                    writer.write(b"\x90\x03" + body[:2] + b"\x01")
                elif header >> 4 == 12:  # PINGREQ
                    writer.write(b"\xd0\x00")
                await writer.drain()
        except (asyncio.IncompleteReadError, ConnectionError):
            pass
        finally:
            writer.close()

    async def scenario() -> str:
        server = await asyncio.start_server(serve, "127.0.0.1", 0)
        port = server.sockets[0].getsockname()[1]
        settings = MqttSettings(
            host="127.0.0.1", port=port, client_id="old-broker", protocol=Protocol.AUTO,
            reconnect_min_s=0.05, reconnect_max_s=0.2,
        )  # fmt: skip
        client = MqttClient(settings)
        await client.start()
        try:
            async with asyncio.timeout(20):
                await client.wait_connected()
                await client.subscribe("edge/x/commands")
            return client.protocol
        finally:
            await client.stop()
            server.close()
            await server.wait_closed()

    assert asyncio.run(scenario()) == "3.1.1"
    assert levels[0] == 5
    assert levels[-1] == 4
