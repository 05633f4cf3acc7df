"""Work on the cards: choosing and pinning cards, launching detached jobs, their supervisor and
records, GPU memory limits, and signalling processes the user owns.

Jobs read the cards only through cards/ backends, like every other view, and reach other hosts
through remote/.
"""
