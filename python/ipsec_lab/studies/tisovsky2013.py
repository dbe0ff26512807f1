"""Study 2: Tisovsky & Baronak, "Analytical Model of IPsec Process Throughput" (2013).

Two Cisco 1841 routers, tunnel mode, iperf UDP with the RFC 2889 search for the loss-free
rate. The model was fitted at 128 and 1280 bytes (Table 1) and checked at 64, 512 and
1420 bytes (Table 2, measured / calculated). Rates in Mbit/s, t_fix in ms.
"""

from __future__ import annotations

# Secured-length form per transform: eq. 5 (AH, 64-byte hash blocks) and eq. 6 (ESP with
# the cipher's block: 8 for DES/3DES, 16 for AES).
LALG: dict[str, str] = {
    "AH-sha1": "ah:64",
    "AH-md5": "ah:64",
    "ESP-des": "esp:8",
    "ESP-3des": "esp:8",
    "ESP-aes128": "esp:16",
    "ESP-aes192": "esp:16",
    "ESP-aes256": "esp:16",
}

# The same transforms as configurations our model lays out precisely.
CONFIGURATION: dict[str, str] = {
    "AH-sha1": "ah:sha1",
    "AH-md5": "ah:md5",
    "ESP-des": "esp:des",
    "ESP-3des": "esp:3des",
    "ESP-aes128": "esp:aes128",
    "ESP-aes192": "esp:aes192",
    "ESP-aes256": "esp:aes256",
}

# Table 1: transform -> (R at 128 B, R at 1280 B, t_fix ms, R_alg Mbit/s).
TABLE1: dict[str, tuple[float, float, float, float]] = {
    "AH-sha1": (2.003, 12.919, 0.4761, 32.749),
    "AH-md5": (2.152, 14.838, 0.4489, 42.986),
    "ESP-des": (2.233, 8.965, 0.3778, 13.483),
    "ESP-3des": (1.712, 4.399, 0.3939, 5.323),
    "ESP-aes128": (2.204, 11.382, 0.4098, 21.179),
    "ESP-aes192": (2.079, 10.285, 0.4296, 18.316),
    "ESP-aes256": (1.987, 9.576, 0.4472, 16.630),
}

# Table 2: transform -> {size: (measured, calculated)}.
TABLE2: dict[str, dict[int, tuple[float, float]]] = {
    "AH-sha1": {64: (1.021, 1.033), 512: (6.870, 6.769), 1420: (13.691, 13.788)},
    "AH-md5": {64: (1.086, 1.103), 512: (7.618, 7.484), 1420: (15.800, 15.912)},
    "ESP-des": {64: (1.235, 1.217), 512: (6.021, 5.967), 1420: (9.233, 9.289)},
    "ESP-3des": {64: (1.002, 1.019), 512: (3.534, 3.489), 1420: (4.485, 4.508)},
    "ESP-aes128": {64: (1.613, 1.625), 512: (6.771, 6.718), 1420: (11.959, 11.983)},
    "ESP-aes192": {64: (1.097, 1.102), 512: (6.222, 6.204), 1420: (10.738, 10.803)},
    "ESP-aes256": {64: (1.053, 1.056), 512: (5.921, 5.851), 1420: (9.904, 10.004)},
}

# Cells of the paper that its own parameters do not give (see docs/seed-studies.md).
MISPRINTS: dict[tuple[str, int], str] = {
    ("ESP-aes128", 64): "the row's own t_fix and R_alg give about 1.16 Mbit/s, not 1.625",
}
