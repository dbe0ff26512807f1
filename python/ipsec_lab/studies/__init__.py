"""The seed studies: each one's published figures as data (with the paper's table or
figure number) and, as the lab grows, its experiment. See docs/seed-studies.md."""
