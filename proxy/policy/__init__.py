"""Who may do what and where it goes: keys, channels and their health, the models a key may use."""
